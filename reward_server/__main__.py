"""``python -m reward_server``: same as the ``reward-server`` console script."""

import sys

from reward_server.cli import main

if __name__ == "__main__":
    sys.exit(main())
