"""The driver process: `fit()` (DataParallelTrainer; TorchTrainer is re-exported by minitrain.torch) and what only the
process that calls it needs: the run directory, the resource wait, the local mode, the console and log files, the
payload pickler and the texts `fit()` prints. Nothing in an agent or a worker imports this package."""
