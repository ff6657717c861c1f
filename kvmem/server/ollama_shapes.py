"""Ollama's API shapes and their OpenAI counterparts: the translation both ways.

Requests (`/api/chat`, `/api/generate`, `/api/show`) are validated here and turned into
OpenAI messages and parameters; the model's OpenAI answers (whole, or chunks as they stream)
are turned into Ollama's replies by `kvmem.server.ollama_replies`. It knows nothing of HTTP, memory
or the upstream: the routes in `kvmem.server.routes.ollama` put it in front of the main call.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from kvmem.errors import BadRequest

# The Ollama API version whose shapes kvmem serves (clients gate features on it: tools,
# structured outputs and `think` are all older than this).
OLLAMA_API_VERSION = "0.9.0"
# The providers whose model ids Ollama clients know without the litellm prefix.
OLLAMA_PROVIDERS = ("ollama", "ollama_chat")
CAPABILITIES = ["completion", "tools"]


class OllamaBody(BaseModel):
    """An Ollama request body: types are checked, unknown fields ignored (as Ollama does:
    clients send fields for features kvmem has no use for, like `keep_alive` or `raw`)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class Options(OllamaBody):
    """`options`: the ones an OpenAI-compatible upstream understands; the rest are ignored."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | str | None = None
    num_predict: int | None = None

    def as_openai(self) -> dict[str, Any]:
        """The OpenAI request parameters these options stand for."""
        params: dict[str, Any] = {}
        for name in ("temperature", "top_p", "seed", "stop"):
            value = getattr(self, name)
            if value is not None:
                params[name] = value
        # Ollama's -1 (no limit) and -2 (fill the context) have no OpenAI spelling: no limit.
        if self.num_predict is not None and self.num_predict > 0:
            params["max_tokens"] = self.num_predict
        return params


class FunctionCall(OllamaBody):
    """`{"name", "arguments": {...}}` of a tool call in the history."""

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCall(OllamaBody):
    """A tool call an assistant message of the history made."""

    function: FunctionCall


def _images(images: list[str] | None) -> list[str] | None:
    for index, image in enumerate(images or ()):
        image_type(image, f"images[{index}]")
    return images


# Base64 images, checked to be ones an OpenAI-compatible model takes.
Images = Annotated[list[str] | None, AfterValidator(_images)]


class Message(OllamaBody):
    """One message of `/api/chat`'s `messages`."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: Images = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None


Format = Literal["", "json"] | dict[str, Any] | None


class Generation(OllamaBody):
    """What `/api/chat` and `/api/generate` share: each is read here and asked for its
    OpenAI messages and parameters (`openai_messages`, `params`)."""

    kind: ClassVar[Literal["chat", "generate"]]

    model: str = Field(min_length=1)
    stream: bool = True
    options: Options | None = None
    format: Format = None

    @field_validator("format", mode="before")
    @classmethod
    def _format(cls, value: Any) -> Any:
        if value is None or value in ("", "json") or isinstance(value, dict):
            return value
        raise ValueError('format must be "json" or a JSON schema object')

    @property
    def loads_only(self) -> bool:
        """A request with nothing to answer: Ollama's way of loading the model."""
        raise NotImplementedError

    def openai_messages(self) -> list[dict[str, Any]]:
        """The request as OpenAI messages."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """The OpenAI parameters for `options` and `format`."""
        params = self.options.as_openai() if self.options else {}
        if self.format == "json":
            params["response_format"] = {"type": "json_object"}
        elif isinstance(self.format, dict):
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": self.format},
            }
        return params


class ChatBody(Generation):
    """`POST /api/chat`."""

    kind = "chat"

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    @property
    def loads_only(self) -> bool:
        """No messages: load the model, answer nothing."""
        return not self.messages

    def openai_messages(self) -> list[dict[str, Any]]:
        """The chat history as OpenAI messages (`chat_messages`)."""
        return chat_messages(self.messages)

    def params(self) -> dict[str, Any]:
        """`options`, `format` and `tools` (Ollama's tools are OpenAI's function tools)."""
        params = super().params()
        if self.tools:
            params["tools"] = self.tools
        return params


class GenerateBody(Generation):
    """`POST /api/generate`."""

    kind = "generate"

    prompt: str = ""
    system: str | None = None
    images: Images = None

    @property
    def loads_only(self) -> bool:
        """No prompt and no image: load the model, answer nothing."""
        return not self.prompt and not self.images

    def openai_messages(self) -> list[dict[str, Any]]:
        """`system` and `prompt` as OpenAI messages (`generate_messages`)."""
        return generate_messages(self)


class ShowBody(OllamaBody):
    """`POST /api/show` (`name` is what older clients send)."""

    model: str | None = None
    name: str | None = None

    @property
    def wanted(self) -> str:
        """The model asked about."""
        wanted = self.model or self.name
        if not wanted:
            raise BadRequest("'model' is required")
        return wanted


# --- requests -------------------------------------------------------------------------------

# The first bytes of each image format OpenAI-compatible models take.
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
)


def image_type(image: str, where: str) -> str:
    """The media type of a base64 image (Ollama sends bare base64; OpenAI wants a data URL)."""
    try:
        head = base64.b64decode(image[:32], validate=True) if image else b""
        base64.b64decode(image, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{where} is not base64-encoded image data") from exc
    for magic, kind in _IMAGE_MAGIC:
        if head.startswith(magic):
            return kind
    raise ValueError(f"{where} is not a PNG, JPEG, GIF or WebP image")


def user_content(text: str, images: Sequence[str] | None) -> str | list[dict[str, Any]]:
    """A message's content: the text, or OpenAI parts (the text, then each image)."""
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for image in images:
        url = f"data:{image_type(image, 'image')};base64,{image}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def chat_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Ollama's chat history as OpenAI messages.

    Ollama's tool calls carry no ids, so each gets one here and each tool answer takes the id
    of the call it answers: the first pending call of its `tool_name`, else the first pending.
    """
    converted: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of calls not answered yet
    for index, message in enumerate(messages):
        text = message.content or ""
        if message.role == "assistant" and message.tool_calls:
            calls = []
            pending = []
            for number, call in enumerate(message.tool_calls):
                call_id = f"call_{index}_{number}"
                arguments = call.function.arguments
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": arguments
                            if isinstance(arguments, str)
                            else json.dumps(arguments),
                        },
                    }
                )
                pending.append((call_id, call.function.name))
            converted.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        elif message.role == "tool":
            match = next((p for p in pending if p[1] == message.tool_name), None) or (
                pending[0] if pending else None
            )
            if match is not None:
                pending.remove(match)
            call_id = match[0] if match else f"call_{index}"
            converted.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            converted.append({"role": message.role, "content": user_content(text, message.images)})
    return converted


def generate_messages(body: GenerateBody) -> list[dict[str, Any]]:
    """`/api/generate`'s `system` and `prompt` as OpenAI messages."""
    messages: list[dict[str, Any]] = []
    if body.system:
        messages.append({"role": "system", "content": body.system})
    messages.append({"role": "user", "content": user_content(body.prompt, body.images)})
    return messages


def resolve_model(wanted: str, served: Sequence[str]) -> str | None:
    """The served model id an Ollama client means, or None.

    A listed id matches as is or with Ollama's default tag `:latest`; an id of litellm's
    Ollama providers (`ollama/llama3.1`) also matches the upstream's own name (`llama3.1`,
    `llama3.1:latest`), so tools configured for that Ollama keep their model names.
    """
    names = (wanted, wanted.removesuffix(":latest"))
    for model in served:
        if model in names:
            return model
    for model in served:
        provider, _, name = model.partition("/")
        if provider in OLLAMA_PROVIDERS and name in names:
            return model
    return None


# --- models ---------------------------------------------------------------------------------


def timestamp(at: datetime | None = None) -> str:
    """Ollama's time format: RFC 3339 in UTC with fractions."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def model_details(model: str) -> dict[str, Any]:
    """`details` of a served model: kvmem knows its provider, not its weights."""
    provider = model.partition("/")[0] if "/" in model else ""
    return {
        "parent_model": "",
        "format": "",
        "family": provider,
        "families": [provider] if provider else None,
        "parameter_size": "",
        "quantization_level": "",
    }


def model_entry(model: str, modified_at: str) -> dict[str, Any]:
    """One model of `/api/tags`."""
    return {
        "name": model,
        "model": model,
        "modified_at": modified_at,
        "size": 0,
        "digest": hashlib.sha256(model.encode()).hexdigest(),
        "details": model_details(model),
    }


def show_reply(model: str, modified_at: str) -> dict[str, Any]:
    """`/api/show`'s answer for a served model."""
    return {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": model_details(model),
        "model_info": {},
        "capabilities": CAPABILITIES,
        "modified_at": modified_at,
    }
