"""The data path, in the order data flows.

dataset -> prompts -> tokenization -> workplan -> scheduler -> attempts -> writer -> manifest;
``pipeline`` wires them. ``verify`` and ``planning`` read what the data path reads or wrote.
"""
