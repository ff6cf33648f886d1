// Drawing the conversation list and the messages. Every piece of text from the model or the
// user goes in as text (textContent, or markdown.js's text nodes), never as HTML.

import { renderMarkdown } from "./markdown.js";

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(className, label, onClick) {
  const node = element("button", className, label);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

/** The sidebar's list: `actions.open(conversation)` and `actions.remove(conversation)`. */
export function drawConversationList(list, conversations, current, actions) {
  list.replaceChildren(
    ...conversations
      .filter((conversation) => conversation.messages.length > 0)
      .sort((a, b) => b.updated - a.updated)
      .map((conversation) => {
        const item = element("li", conversation === current ? "current" : "");
        item.dataset.id = conversation.id;
        item.append(
          button("open", conversation.title, () => actions.open(conversation)),
          button("delete", "×", () => actions.remove(conversation)),
        );
        item.lastChild.title = "Delete this conversation";
        return item;
      }),
  );
}

/**
 * Draws every message of `conversation` into `container`. `actions` holds `regenerate()`,
 * `edit(message, text)`, `speak(message)` (or null without a speech model), and `busy`,
 * true while a reply streams (the last message's buttons are then hidden).
 */
export function drawMessages(container, conversation, actions) {
  const messages = conversation.messages;
  const lastUser = messages.findLastIndex((message) => message.role === "user");
  container.replaceChildren(
    ...messages.map((message, index) => {
      const node = element("article", `message ${message.role}`);
      fillMessage(node, message);
      if (!actions.busy) {
        const footer = node.querySelector("footer");
        if (message.role === "user" && index === lastUser) {
          footer.append(button("edit", "Edit", () => startEditing(node, message, actions)));
        }
        if (message.role !== "user" && index === messages.length - 1) {
          const label = message.role === "error" ? "Retry" : "Regenerate";
          footer.append(button("regenerate", label, actions.regenerate));
        }
        if (message.role === "assistant" && message.content && actions.speak) {
          footer.append(button("play", "Play", () => actions.speak(message)));
        }
      }
      return node;
    }),
  );
  container.scrollTop = container.scrollHeight;
}

/**
 * Redraws one message in place (a streaming reply), keeping the reasoning's open state, and
 * keeps the list scrolled to the end if it was there.
 */
export function updateMessage(node, message) {
  const container = node.parentElement;
  const atEnd = container.scrollHeight - container.scrollTop - container.clientHeight < 40;
  const open = node.querySelector("details.reasoning")?.open ?? false;
  const footer = node.querySelector("footer");
  const buttons = footer ? [...footer.querySelectorAll("button")] : [];
  node.replaceChildren();
  fillMessage(node, message);
  node.querySelector("footer").append(...buttons);
  const details = node.querySelector("details.reasoning");
  if (details) details.open = open;
  if (atEnd) container.scrollTop = container.scrollHeight;
}

function fillMessage(node, message) {
  if (message.role === "assistant" && message.reasoning) {
    const details = element("details", "reasoning");
    const thinking = !message.content && !message.done;
    details.append(
      element("summary", "", thinking ? "Thinking…" : "Reasoning"),
      element("div", "reasoning-text", message.reasoning),
    );
    node.append(details);
  }
  if (message.images?.length) {
    const images = element("div", "images");
    for (const url of message.images.filter((url) => url.startsWith("data:image/"))) {
      const image = element("img");
      image.src = url;
      image.alt = "attached image";
      images.append(image);
    }
    node.append(images);
  }
  const content = element("div", "content");
  if (message.role === "assistant") {
    content.append(renderMarkdown(message.content));
  } else {
    content.textContent = message.content;
  }
  node.append(content);
  const footer = element("footer", "meta");
  footer.append(element("span", "stats", describeStats(message)));
  node.append(footer);
}

/** "12 tokens, 8.4 tokens/s · prompt 30 tokens, 95.1 tokens/s", or why the reply ended. */
export function describeStats(message) {
  if (message.role !== "assistant") return "";
  if (message.stopped) return "stopped";
  const parts = [];
  const { usage, timings } = message;
  if (usage) {
    let reply = `${usage.completion_tokens} tokens`;
    if (timings?.predicted_per_second) {
      reply += `, ${timings.predicted_per_second.toFixed(1)} tokens/s`;
    }
    let prompt = `prompt ${usage.prompt_tokens} tokens`;
    if (timings?.prompt_per_second) prompt += `, ${timings.prompt_per_second.toFixed(1)} tokens/s`;
    parts.push(reply, prompt);
  }
  if (message.finish === "length") parts.push("cut at the token limit");
  return parts.join(" · ");
}

function startEditing(node, message, actions) {
  const editor = element("textarea", "editor");
  editor.value = message.content;
  editor.rows = Math.min(12, message.content.split("\n").length + 1);
  const save = button("save", "Send", () => actions.edit(message, editor.value));
  const cancel = button("cancel", "Cancel", () => node.replaceChildren(...original));
  const original = [...node.childNodes];
  node.replaceChildren(editor, element("footer", "meta"));
  node.lastChild.append(save, cancel);
  editor.focus();
}
