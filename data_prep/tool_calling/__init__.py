"""Tool-calling data: ``build`` (BFCL's AST-checkable categories and the peers' public sets; the command line),
``rows`` (the row schema the builders share, ``data_prep.multi_turn`` included), ``sources`` (the peers' public
training sets). ``python -m data_prep.tool_calling`` runs ``build``."""
