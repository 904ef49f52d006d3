"""NiceGUI pages and components. Pages call `core` services; they hold no rules and no SQL."""

from __future__ import annotations

from core.services import Services


def register_pages(services: Services) -> None:
    """Register every page (called from `app.py` each time it runs, as the User fixture needs)."""
    from ui.agents_page import register_agents_page
    from ui.api_keys_page import register_api_keys_page
    from ui.audit_page import register_audit_pages
    from ui.auth import install_login_middleware, register_login_pages
    from ui.broker_page import register_broker_pages
    from ui.chat_page import register_chat_pages
    from ui.language import install as install_languages
    from ui.remote_agents_page import register_remote_agents_page

    install_languages()  # core.i18n finds the language of the page whose callback runs
    install_login_middleware(services)
    register_login_pages(services)
    register_chat_pages(services)
    register_audit_pages(services)
    register_api_keys_page(services)  # issue 6: keys for A2A callers
    register_remote_agents_page(services)  # issue 6: remote A2A agents by card URL
    register_broker_pages(services)  # issue 5: the seed-003 broker, live
    register_agents_page(services)  # issue 15: agents made and changed in the app
