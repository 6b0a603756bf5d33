"""Text-to-SQL data: ``build`` (Spider, BIRD and Chinook rows; the command line), ``rows`` (the row schema the
builders share), ``sources`` (the peers' public training sets). ``python -m data_prep.text_to_sql`` runs ``build``."""
