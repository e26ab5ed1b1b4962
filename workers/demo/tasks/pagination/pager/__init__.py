from .paginate import Page, paginate, total_pages

__all__ = ["Page", "paginate", "total_pages"]
