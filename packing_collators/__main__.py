"""``python -m packing_collators``: the ``packing-collators`` command line."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
