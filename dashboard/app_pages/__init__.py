"""One file per page; pages only wire widgets to attnscope.dashboard.plots functions."""
