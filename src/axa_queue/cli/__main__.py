"""`python -m axa_queue.cli`: the `axa-queue` command."""

from . import main

if __name__ == "__main__":
    main(prog_name="axa-queue")
