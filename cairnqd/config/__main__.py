"""`python -m cairnqd.config > config/cairnq.example.yaml` regenerates the example."""

from cairnqd.config import render_example

print(render_example(), end="")
