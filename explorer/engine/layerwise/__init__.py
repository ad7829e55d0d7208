"""layerwise"""
