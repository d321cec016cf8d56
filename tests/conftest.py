"""Test-wide settings.

``HYPOTHESIS_PROFILE=ci`` (set by ``.ci/run``) makes every property test draw the same
examples on every run, so CI passes or fails reproducibly; locally the default profile
draws new examples each time and keeps looking for counterexamples.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
