"""The names a user picks from: engines and scheduling policies. One list each, read by the CLI's
choices, ``RunConfig``'s checks and the DAG form's enums. Imports nothing, so DAG files stay fast to parse."""

ENGINES = ("vllm", "transformers", "simulator")

# What users A/B: the default first. Registered in ``blendserve.policies`` by ``blendserve.planner``
# (tests check that every registered policy is in one of these two lists).
PUBLIC_POLICIES = ("blendserve", "blendserve-nosplit", "dfs", "density", "fcfs", "balance")
# Registered for the benches and the simulator; not offered in the form or the CLI.
EXPERIMENTAL_POLICIES = ("blendserve-static", "blendserve-spread")
