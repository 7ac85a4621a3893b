"""Training on the rewards: the policy server (the trainer's model as an upstream), the trainer
integrations and the adapters from the feed to trainers' batch shapes (docs/training.md)."""
