"""tofu"""
