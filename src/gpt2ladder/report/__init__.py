"""Records and how people read them: the header every record carries and safe writing (`records`),
terminal and Markdown tables, charts (matplotlib, Agg), progress bars; one module per record kind."""
