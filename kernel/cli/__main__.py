"""``python -m kernel.cli``: the same as the ``blis-kernel`` script."""

from . import main

if __name__ == "__main__":
    main()
