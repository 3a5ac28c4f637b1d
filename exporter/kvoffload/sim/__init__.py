"""A simulator of one vLLM server with native CPU KV offloading, on a virtual clock.

It stands in for a GPU in tests and demos. The scenario library is in docs/scenarios.md.

    from kvoffload.sim import scenarios, SimServer
    sim = SimServer(scenarios.get("laptop-eviction"), seed=0)
    sim.advance_to(300.0)
    body = sim.render()           # /metrics in vLLM's exact format
    truth = sim.ground_truth()    # what really happened
"""

from . import scenarios
from .config import Scenario, Sizing
from .model import Hardware, ModelShape
from .simulator import SimServer
from .workload import Workload

__all__ = ["Hardware", "ModelShape", "Scenario", "SimServer", "Sizing", "Workload", "scenarios"]
