"""`python -m cairnqd.config > config/cairnq.example.yaml` regenerates the example;
`python -m cairnqd.config --reference > docs/configuration.md` the reference page."""

import sys

from cairnqd.config import render_example
from cairnqd.config.reference import render_reference

print(render_reference() if "--reference" in sys.argv[1:] else render_example(), end="")
