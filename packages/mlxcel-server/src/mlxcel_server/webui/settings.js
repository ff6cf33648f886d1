// The settings drawer: the system prompt and the sampling fields of each request, starting
// from the server's defaults (`/props`) and kept in local storage once changed.

import { loadSettings, saveSettings } from "./store.js";

const NUMBERS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];
const INTEGERS = new Set(["top_k", "max_tokens", "seed"]);

/** The server's defaults, in the drawer's names, from `/props`' `params`. */
export function defaultsFrom(props) {
  const params = props?.default_generation_settings?.params ?? {};
  return {
    system: "",
    temperature: params.temperature ?? 0.8,
    top_p: params.top_p ?? 0.95,
    top_k: params.top_k ?? 40,
    min_p: params.min_p ?? 0.05,
    max_tokens: params.n_predict ?? -1,
    seed: params.seed ?? -1,
  };
}

export class SettingsDrawer {
  constructor(drawer) {
    this.drawer = drawer;
    this.defaults = defaultsFrom(null);
    this.changed = loadSettings();
    this.field("system").addEventListener("input", () => this.read("system"));
    for (const name of NUMBERS) {
      this.field(name).addEventListener("change", () => this.read(name));
    }
    drawer.querySelector("#reset-settings").addEventListener("click", () => {
      this.changed = {};
      saveSettings(this.changed);
      this.fill();
    });
    drawer.querySelector("#close-settings").addEventListener("click", () => this.toggle(false));
  }

  field(name) {
    return this.drawer.querySelector(`#setting-${name}`);
  }

  setDefaults(defaults) {
    this.defaults = defaults;
    this.fill();
  }

  fill() {
    const values = this.values();
    this.field("system").value = values.system;
    for (const name of NUMBERS) this.field(name).value = String(values[name]);
  }

  read(name) {
    const text = this.field(name).value;
    if (name === "system") {
      this.changed.system = text;
    } else if (text.trim() === "") {
      delete this.changed[name];
    } else {
      const value = INTEGERS.has(name) ? parseInt(text, 10) : Number(text);
      if (Number.isFinite(value)) this.changed[name] = value;
    }
    saveSettings(this.changed);
  }

  values() {
    return { ...this.defaults, ...this.changed };
  }

  toggle(open = this.drawer.hidden) {
    this.drawer.hidden = !open;
  }

  /** The request fields of the current settings; -1 (no limit, a random seed) sends none. */
  requestFields() {
    const values = this.values();
    const fields = {
      temperature: values.temperature,
      top_p: values.top_p,
      top_k: values.top_k,
      min_p: values.min_p,
    };
    if (values.max_tokens > 0) fields.max_tokens = values.max_tokens;
    if (values.seed >= 0) fields.seed = values.seed;
    return fields;
  }

  systemPrompt() {
    return this.values().system.trim();
  }
}
