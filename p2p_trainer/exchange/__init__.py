"""The exchange interface (`interface`: average tensors with a group, as a value) and its exact
in-process backend (`inprocess`). The network backend lives in `p2p_trainer.net.network_exchange`."""
