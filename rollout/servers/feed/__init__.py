"""The feed of finished groups for training (service, group assembly, export): docs/feed.md."""
