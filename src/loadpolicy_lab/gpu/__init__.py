"""`loadpolicy dev gpu`: what only a GPU shows, in one command (`tox -e gpu`): loads, saves and training on the
device, and partition reads against the storage and copy limits. docs/gpu.md."""
