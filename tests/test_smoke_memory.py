from __future__ import annotations


def test_put_then_list(make_client):
    client = make_client(memory={"tokenLimit": 100})
    response = client.put("/memory/user_preferences", json={"value": " Prefers short answers. "})
    assert response.status_code == 201
    body = response.json()
    assert body["memory"]["value"] == "Prefers short answers."
    assert body["memory"]["token_count"] == 5
    assert body["total_tokens"] == 5 and body["token_limit"] == 100
    listing = client.get("/memory").json()
    assert [m["key"] for m in listing["memories"]] == ["user_preferences"]
    assert listing["usage_percentage"] == 5.0
