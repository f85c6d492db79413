"""Entry point for `ray submit cluster/config.yaml cluster/train.py [launch options]`.

Runs on the head node and joins the cluster that `ray up` started (address "auto").
"""

import sys

from reflectrl.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--address" not in args:
        args = ["--address", "auto", *args]
    sys.exit(main(["launch", *args]))
