"""venus-gym: environments and trainers for small deep-research agents."""

__version__ = "0.1.0"
