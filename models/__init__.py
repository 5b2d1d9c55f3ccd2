"""Shipped model files (`models/demo-en`: the embedded demo model), installed as data of `pcgtts.models`."""
