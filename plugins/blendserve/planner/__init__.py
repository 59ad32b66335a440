"""BlendServe's tree side: what the scheduling policies are built on.

- ``prefix_tree`` (with ``lcp``): the resource-aware prefix tree, one leaf per distinct inference.
- ``sort_split``: layer-wise density sort, conditional node splitting, the depth-first order.
- ``groups``: the density-ordered leaf list cut into groups.
- ``items``: that list as ``ScanItems``, what ``blendserve.scheduling`` walks.
- ``shards``: the data-parallel cut of a stream into balanced shards of whole subtrees.
- ``estimates``: the output lengths a tree is built on before anything has run.
"""
