"""One file per page; pages only wire widgets to dashboard.plots functions."""
