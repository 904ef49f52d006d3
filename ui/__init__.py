"""NiceGUI pages and components. Pages call `core` services; they hold no rules and no SQL."""

from __future__ import annotations

from core.services import Services


def register_pages(services: Services) -> None:
    """Register every page (called from `app.py` each time it runs, as the User fixture needs)."""
    from ui.admin_page import register_admin_page
    from ui.agents_page import register_agents_page
    from ui.api_keys_page import register_api_keys_page
    from ui.audit_page import register_audit_pages
    from ui.auth import install_login_middleware, register_login_pages
    from ui.broker_page import register_broker_pages
    from ui.chat_page import register_chat_pages
    from ui.chat_services import ChatServices
    from ui.language import install as install_languages
    from ui.remote_agents_page import register_remote_agents_page

    install_languages()  # core.i18n finds the language of the page whose callback runs
    # Each page gets the services it uses. `services.auth` is settled: `Services.prepare` ran before this.
    auth = services.auth
    install_login_middleware(auth)
    register_login_pages(auth=auth, logins=services.logins)
    register_chat_pages(
        ChatServices(
            auth=auth,
            chat=services.chat,
            delegation=services.delegation,
            hub=services.hub,
            settings=services.settings,
            workspace=services.workspace,
        )
    )
    register_audit_pages(delegation=services.delegation, auth=auth)
    register_api_keys_page(keys=services.api_keys, auth=auth, base_url=services.settings.base_url)  # issue 6
    register_remote_agents_page(remote_agents=services.remote_agents, auth=auth)  # issue 6: by card URL
    register_broker_pages(broker=services.broker, auth=auth)  # issue 5: the seed-003 broker, live
    register_agents_page(admin=services.agent_admin, auth=auth)  # issue 15: agents made and changed in the app
    register_admin_page(area=services.admin, auth=auth)  # issue 39: accounts, model connection, health
