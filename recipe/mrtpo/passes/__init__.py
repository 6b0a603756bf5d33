"""The passes' wire between the driver and the actor workers, below the methods that use it: ``pass_driver``
(``PassRequest``: the rows, render, dispatch and settings of a pass; rows balanced over ranks), ``pass_wire`` (what
the worker side of a pass is handed), ``tree_attention`` (the shared forwards' block-sparse attention registered
with transformers)."""
