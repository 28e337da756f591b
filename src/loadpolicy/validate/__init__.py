"""`loadpolicy validate`: real multi-process loads of tiny models on the stock and the patched transformers trees."""
