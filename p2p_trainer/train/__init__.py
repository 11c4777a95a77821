"""One peer's training: the model, the data streams, the loop of inner steps and outer steps
(`trainer.Peer`), checkpoints, anchor snapshots and the per-round metrics file."""
