"""The studies: the registered experiments, one module per lesson (layer 4: they build the course model and
train it with the mechanisms of the layers below)."""
