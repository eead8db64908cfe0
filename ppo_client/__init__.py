"""PPO trainer and reward client for a reward model behind HTTP."""
