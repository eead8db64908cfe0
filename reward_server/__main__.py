"""``python -m reward_server``: same as the ``reward-server`` console script."""

from reward_server.cli import run

if __name__ == "__main__":
    run()
