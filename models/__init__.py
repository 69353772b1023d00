"""attnscope model zoo: small models trained with core on tasks whose right answer is known."""
