"""The coordinator's pure policy: no I/O, no clock, no threads. `decide` (the lifecycle) with its inputs and
outputs (loop, actions), hang deadlines (hangs), rank placement (ranks), round bookkeeping (rounds) and elastic
sizes (elastic). Unit-tested with scripted inputs."""
