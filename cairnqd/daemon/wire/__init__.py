"""The wire between the parent and its children: the typed messages and their framing
on the pipes. Both sides import it; it imports neither."""
