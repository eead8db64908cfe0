"""Text in, token ids out: rendering with the reward model's chat template, process-reward
steps, and recovering conversations from the policy's chat template. Tokenizers only."""
