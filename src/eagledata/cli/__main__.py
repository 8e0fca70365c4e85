"""``python -m eagledata.cli``: the same as the ``eagledata`` command."""

from eagledata.cli import main

main()
