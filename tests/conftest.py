import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# The real Prometheus/Alertmanager helpers (rules_procs) serve tests outside tests/rules too.
sys.path.insert(0, str(Path(__file__).parent / "rules"))
