"""The data path, in the order data flows.

dataset -> prompts -> tokenization -> workplan -> scheduler -> attempts -> writer -> manifest;
``session`` wires them for one session (``first_contact`` reaches and checks the servers);
``pipeline`` holds the entry points, ``generate`` and ``resume``. ``verify`` and ``planning``
read what the data path reads or wrote.
"""
