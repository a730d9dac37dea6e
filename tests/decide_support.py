"""Driving the controller's pure policy (`minitrain.coordinator.policy.decide.decide`) through a script of
observations, for the unit tests of the fixed-size and the elastic rules."""

from __future__ import annotations

from minitrain.coordinator.policy.decide import decide
from minitrain.coordinator.policy.loop import Loop, Rules


def run_script(script, loop: Loop, rules: Rules):
    """Feed (seen, now) pairs to `decide`, carrying the loop from one decision to the next; return the
    final loop and every action, in order."""
    actions = []
    for seen, now in script:
        decision = decide(loop, seen, now, rules)
        loop = decision.loop
        actions.extend(decision.actions)
    return loop, actions
