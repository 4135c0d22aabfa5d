import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { Client } from "@runledger/client";
import { RunledgerProvider } from "@runledger/client/react";
import { App } from "./App";

// Where Runledger is, and the API token to call it with, from config.json beside this page.
// Your app would get a short-lived token for its signed-in user from its own backend instead.
const config: { baseUrl: string; token: string } = await (await fetch("config.json")).json();
const client = new Client({ baseUrl: config.baseUrl, token: config.token });

createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <RunledgerProvider client={client}>
      <App />
    </RunledgerProvider>
  </StrictMode>,
);
