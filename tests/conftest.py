import os

from hypothesis import HealthCheck, settings

# Plans are drawn while the model follows along, and each example may run on real ranks: no per-example
# deadline, and generation is allowed to be slower than Hypothesis' default budget.
settings.register_profile("meshsim", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("thorough", parent=settings.get_profile("meshsim"), max_examples=500)
# CI draws the same examples on every run (derandomize), so what lands is what was tested; a developer's runs draw
# new ones each time and go on finding what the fixed draw does not.
settings.register_profile("ci", parent=settings.get_profile("meshsim"), derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "meshsim"))

pytest_plugins = ["pytester"]
