"""From a window of scrapes to figures, a verdict and advice."""
