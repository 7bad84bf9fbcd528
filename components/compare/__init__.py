"""The compare step as a KFP component (component.py) over ampbench.compare."""
