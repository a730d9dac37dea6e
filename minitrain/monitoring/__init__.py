"""What watches a run from the driver: the run monitor (the dashboard's and console's view-model), stragglers,
diagnoses and the console's status line. Told by the coordinator through its observers; never changes the run."""
