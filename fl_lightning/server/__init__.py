"""The server's side of a federation: what an algorithm knows and holds (``Federation``), what it may ask of the loop (``ServerServices``) and the model state it aggregates into."""
