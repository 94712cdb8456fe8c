#!/usr/bin/env python3
"""test_openai_client.py — the official `openai` Python client against pdserve-router in front of
a real pdserve-prefill and pdserve-decode (127.0.0.1, UCX over shared memory): what a user's
existing code does, unchanged. Models list; completions and chat, streamed and not, with
stream_options.include_usage (also streamed with logprobs: one entry per token, the tokens spell
the text); greedy text equals pdserve-generate's; usage adds up; an unknown model is a
NotFoundError; an API key is sent as the client sends it.

Exits 77 (CTest SKIP) with a message when `import openai` fails. Usage:
test_openai_client.py BUILD_DIR
"""
import os
import subprocess
import sys
import time

try:
    import openai
except ImportError as e:
    print("SKIP: the openai package is not installed (%s); pip install openai to run this test" %
          e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pd_cluster as pc  # noqa: E402
from pd_cluster import check  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
TOKENIZE = os.path.join(BUILD, "tools", "pdserve-tokenize")
KEY = "sk-pdserve-openai-test"
MAX_NEW = 16


def generate_ref(model, prompt=None, ids=None):
    return pc.generate(BUILD, model, ids if ids is not None else prompt, MAX_NEW)


def chat_ref(model, pf, messages, tmp):
    ids = pc.chat_prompt_ids(BUILD, model, pf, messages, tmp)
    return generate_ref(model, ids=ids), len(ids)


def run(model, tmp):
    key_args = ["--api-key", KEY]
    pf, dc, rt = pc.start_cluster(BUILD, tmp, model, key_args, key_args, key_args)
    for proc in (pf, dc, rt):
        proc.auth = {"Authorization": "Bearer " + KEY}
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % rt.port, api_key=KEY,
                           timeout=60, max_retries=0)

    models = client.models.list()
    ids = [m.id for m in models.data]
    check(len(ids) == 1 and models.data[0].owned_by == "sglang", "models.list: %r" % models)
    name = ids[0]

    prompt = "the quick brown fox jumps over the lazy dog"
    ref = generate_ref(model, prompt)
    n_prompt = len(subprocess.run([TOKENIZE, "--model-path", model], input=prompt + "\n",
                                  capture_output=True, text=True, check=True).stdout.split())

    # completions, not streamed
    c = client.completions.create(model=name, prompt=prompt, max_tokens=MAX_NEW, temperature=0)
    check(c.object == "text_completion" and c.id.startswith("cmpl-"), "completion: %r" % c)
    check(c.choices[0].text == ref, "completion text %r != pdserve-generate %r" %
          (c.choices[0].text, ref))
    check(c.choices[0].finish_reason in ("stop", "length"), "finish %r" % c.choices[0].finish_reason)
    u = c.usage
    check(u.prompt_tokens == n_prompt and u.total_tokens == u.prompt_tokens + u.completion_tokens,
          "completion usage %r (prompt %d tokens)" % (u, n_prompt))

    # completions, streamed with include_usage
    text, usage, finish, n_chunks = "", None, None, 0
    for ch in client.completions.create(model=name, prompt=prompt, max_tokens=MAX_NEW,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        n_chunks += 1
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            text += choice.text or ""
            finish = choice.finish_reason or finish
    check(text == ref, "streamed completion %r != %r" % (text, ref))
    check(n_chunks > 2 and finish in ("stop", "length"), "streamed completion: %d chunks, %r" %
          (n_chunks, finish))
    check(usage is not None and usage.prompt_tokens == n_prompt and
          usage.completion_tokens == c.usage.completion_tokens, "include_usage chunk %r" % usage)

    # completions from token ids
    tok_ids = [5, 17, 300, 42, 99, 7, 250, 8, 9, 10, 11, 12]
    c = client.completions.create(model=name, prompt=tok_ids, max_tokens=MAX_NEW, temperature=0)
    check(c.choices[0].text == generate_ref(model, ids=tok_ids), "completion from ids: %r" % c)

    # chat, not streamed and streamed
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Where does the river run?"}]
    cref, n_chat = chat_ref(model, pf, msgs, tmp)
    r = client.chat.completions.create(model=name, messages=msgs, max_tokens=MAX_NEW,
                                       temperature=0)
    m = r.choices[0].message
    check(r.object == "chat.completion" and m.role == "assistant", "chat: %r" % r)
    check(m.content == cref, "chat content %r != pdserve-generate on the chat prompt %r" %
          (m.content, cref))
    check(r.usage.prompt_tokens == n_chat, "chat usage %r (rendered prompt %d tokens)" %
          (r.usage, n_chat))
    text, usage, roles, finish = "", None, [], None
    t0 = time.time()
    ttft = None
    for ch in client.chat.completions.create(model=name, messages=msgs, max_tokens=MAX_NEW,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        check(ch.object == "chat.completion.chunk", "chunk object %r" % ch.object)
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                ttft = ttft or time.time() - t0
                text += choice.delta.content
            finish = choice.finish_reason or finish
    check(text == cref, "streamed chat %r != %r" % (text, cref))
    check(roles[:1] == ["assistant"], "first delta carries the role: %r" % roles)
    check(finish in ("stop", "length"), "streamed chat finish %r" % finish)
    check(usage is not None and usage.prompt_tokens == n_chat and
          usage.completion_tokens == r.usage.completion_tokens, "chat include_usage %r" % usage)
    print("chat stream: %d chars, first content after %.3f s" % (len(text), ttft or -1))

    # logprobs streamed with include_usage: every token's logprob arrives in its chunk, the
    # tokens spell the text, and the usage chunk counts them
    text, toks, tops, usage = "", [], [], None
    for ch in client.completions.create(model=name, prompt=prompt, max_tokens=MAX_NEW,
                                        temperature=0, stream=True, logprobs=2,
                                        stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            text += choice.text or ""
            if choice.logprobs:
                toks += choice.logprobs.tokens
                tops += choice.logprobs.top_logprobs
    check(text == ref and "".join(toks) == text, "completion logprobs stream: tokens %r spell "
          "%r (want %r)" % (toks, text, ref))
    check(usage is not None and len(toks) == usage.completion_tokens and
          all(1 <= len(t) <= 2 for t in tops), "completion logprobs stream: %d tokens, usage %r, "
          "top %r" % (len(toks), usage, tops[:2]))
    content, usage = [], None
    text = ""
    for ch in client.chat.completions.create(model=name, messages=msgs, max_tokens=MAX_NEW,
                                             temperature=0, stream=True, logprobs=True,
                                             top_logprobs=2,
                                             stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            text += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                content += choice.logprobs.content
    check(text == cref and usage is not None and len(content) == usage.completion_tokens,
          "chat logprobs stream: %d entries, usage %r, text %r (want %r)" %
          (len(content), usage, text, cref))
    check(all(isinstance(t.logprob, float) and t.logprob <= 0 and len(t.top_logprobs) == 2 and
              t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in content),
          "chat logprobs stream entries: %r" % content[:2])

    # errors arrive as the client's exception types
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        check(False, "unknown model accepted")
    except openai.NotFoundError:
        pass
    try:
        openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0).models.list()
        check(False, "wrong API key accepted")
    except openai.AuthenticationError:
        pass
    try:
        client.completions.create(model=name, prompt="x", max_tokens=-1)
        check(False, "max_tokens -1 accepted")
    except openai.BadRequestError:
        pass

    check(pf.pool_full() and dc.pool_full(), "pools full at the end")
    for proc in (rt, dc, pf):
        rc = proc.terminate(30)
        check(rc == 0, "%s SIGTERM exit %s" % (proc.name, rc))


def main():
    tmp = pc.tmpdir()
    model = pc.make_model(BUILD, tmp)
    pc.run_test("openai client (openai %s)" % openai.__version__, lambda: run(model, tmp), tmp,
                log_tail=3000)


if __name__ == "__main__":
    main()
