"""The train step as a KFP component (component.py) over ampbench.train."""
