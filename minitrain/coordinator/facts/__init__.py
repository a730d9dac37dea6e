"""What the coordinator knows about the run, one owner per fact: the attempt's failures (attempt), its workers
(worker_group), committed rounds (commits, metrics_log), the nodes (membership), silence (hang_watch), preemption,
the events the transport hands in and the commands it sends out (events, outbox). The controller records into them
and reads them back; none of them decides."""
