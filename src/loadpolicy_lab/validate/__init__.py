"""`loadpolicy dev validate`: real multi-process loads of tiny models on the stock and the patched trees."""
