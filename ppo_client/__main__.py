"""``python -m ppo_client`` (also ``accelerate launch -m ppo_client train ...``)."""

from ppo_client.cli import run

run()
