"""What is computed from traces and models: the mask audit, the mask lab's bugs, head analytics, corpus statistics and the tables the pages show."""
