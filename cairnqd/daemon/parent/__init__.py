"""The parent's side of the daemon: the supervisor, its pools of children, the control
socket, the metrics endpoint, the scheduler and the database maintenance duties."""
